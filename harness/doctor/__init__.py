"""Host and sandbox security checks (``callbox doctor``)."""
