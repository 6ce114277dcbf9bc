"""``importers.fx``, the public name of the torch.fx importer (``importers.torch.fx``)."""

from importers.torch.fx import import_fx, trace

__all__ = ["import_fx", "trace"]
