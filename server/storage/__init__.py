"""Storage: one interface (``interface``), the SQL plans both backends run
(``plans``, ``past``, ``sqlbulk``), and the backends, each in its own package
(``sqlite``, ``postgres``), imported only when ``backends.open_storage`` picks it.
"""
