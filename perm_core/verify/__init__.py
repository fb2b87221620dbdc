"""Verdicts: per-tensor errors and tolerances (tolerances), the check and its report (check), where a failing check
first breaks (first_break), the row against transformers' own forward (oracle), the family x symmetry matrix
(matrix), and `compare`: same function or not, with the group element recovered from the weights alone
(same_function, recover)."""
