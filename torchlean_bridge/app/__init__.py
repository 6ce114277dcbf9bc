"""The application layer: tools built on the core, semantics, importers and exporters."""
