"""A workspace's configuration: value types (``fields``, SPDX license ids: ``spdx``),
models (``models``), loading (``workspace``), URL mirrors, the snapshot of inputs a build
reads (``inputs``), and what is made from the models for people and editors: the TOML
files' JSON Schemas (``schema``) and reference pages (``reference``)."""
