"""The application layer: everything that may import semantics/, importers/ and exporters/."""
