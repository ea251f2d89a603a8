"""A workspace's configuration: value types (``fields``), models (``models``), loading
(``workspace``), URL mirrors, and the snapshot of inputs a build reads (``inputs``)."""
