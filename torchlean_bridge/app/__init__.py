"""The application layer: ABI and checkpoint binding, audits, differential testing, the command line.

The only part of ``torchlean_bridge`` that may import ``semantics``, ``importers`` and ``exporters``;
the core (everything outside this folder) needs only numpy. Public functions are reached through the
package (``tlb.abi``, ``tlb.audit``, ``tlb.diff``), which imports these modules lazily.
"""
