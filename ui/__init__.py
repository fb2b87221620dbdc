"""Streamlit-side helpers shared by the pages: cached resources, sidebar state. No weights here."""
