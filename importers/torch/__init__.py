"""The torch importers: ``fx.import_fx`` (torch.fx symbolic tracing) and ``export.import_export``
(torch.export), over one shared lowerer.

Layout: ``common`` (import-time values and node helpers), ``lowerer`` (the fx.Interpreter-shaped
walk), ``targets`` (the dispatch tables, filled by the registrations at each lowering), the op
modules ``ops_elementwise``, ``ops_layout``, ``ops_index``, ``ops_reduce``, ``ops_rearrange``,
``ops_resize``, ``ops_nn`` and ``modules`` (nn.Module lowerings), ``program`` (the lowerer that
knows every table and binds exported programs). ``importers.fx`` and ``importers.torch_export``
stay the public module names.
"""
