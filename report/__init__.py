"""The visual report: one self-contained HTML page per job (``eroica report``)."""
