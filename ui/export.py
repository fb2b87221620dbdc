"""Every chart with an Export menu: PNG, SVG and the numbers as CSV, each made only when its button is clicked (none
in projector mode: ui.projector)."""

from __future__ import annotations

import copy

import streamlit as st

from ui import projector
from ui.charts import figures
from ui.charts.export import ExportError, figure_csv, figure_image, file_stem
from ui.charts.figures_projector import for_projector


def _image_or_message(fig, fmt: str):
    def render() -> bytes | str:
        try:
            return figure_image(fig, fmt)
        except ExportError as error:  # a download cannot show a message box: the file says what went wrong
            return f"{error}\n"

    return render


def chart(fig, where=None, caption: str | None = None, **options) -> None:
    """st.plotly_chart(fig, **options) in `where` (a column or the page), with `caption` (a sentence of what it
    shows) right under it and its export menu under that."""
    where = where or st
    options.setdefault("width", "stretch")
    if projector.on():  # large texts, and neither the export menu nor plotly's toolbar in a lecture hall
        # on a copy: a figure may be shared (cached for every session), and only this session is in projector mode
        where.plotly_chart(for_projector(figures.powers_of_ten(copy.deepcopy(fig))),
                           config={"displayModeBar": False}, **options)
        if caption:
            where.caption(caption)
        return
    where.plotly_chart(figures.powers_of_ten(fig), **options)
    if caption:
        where.caption(caption)
    stem = file_stem(fig)
    with where.popover("Export", icon=":material/download:"):
        st.download_button("PNG image", _image_or_message(fig, "png"), file_name=f"{stem}.png", mime="image/png",
                           on_click="ignore")
        st.download_button("SVG image", _image_or_message(fig, "svg"), file_name=f"{stem}.svg",
                           mime="image/svg+xml", on_click="ignore")
        st.download_button("Data (CSV)", lambda: figure_csv(fig), file_name=f"{stem}.csv", mime="text/csv",
                           on_click="ignore")
