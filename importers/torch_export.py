"""``importers.torch_export``, the public name of the torch.export importer (``importers.torch.export``)."""

from importers.torch.export import export_program, import_export

__all__ = ["import_export", "export_program"]
