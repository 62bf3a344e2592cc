"""seedance.probes: the bcc programs of `seedance trace` and their small Python loaders.

The C lives in ``*.bpf.c`` files next to this module and shares one event header,
``events.h``; ``layout`` turns that header into the ctypes structure Python reads, and
``loader`` joins the programs into one BPF module and attaches them.  Importing this
package does not import bcc: only ``loader.compile_program`` does.
"""
from pathlib import Path

PROBES_DIR = Path(__file__).resolve().parent
