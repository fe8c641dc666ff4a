"""Report formats: each module lists its reporters in ``REPORTERS`` (see ``opscope.report.registry``)."""
