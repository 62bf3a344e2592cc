"""seedance profiler (seedance-profiler): the notes' spelling of `seedance profile memory`."""
from __future__ import annotations

import argparse

EPILOG = """\
examples:
  seedance-profiler --gpu-id 0 --page-size 4Ki --sample-interval 10ms --output frag.bin -- python train.py
  seedance-profiler --from-trace events.jsonl --output frag.bin --heatmap frag.png

The same flags as `seedance profile memory` (see its --help); `seedance profile show
frag.bin` reads the output back.
"""


def configure_parser(sub) -> None:
    from .profile import add_memory_arguments

    parser = sub.add_parser("profiler", help="GPU memory fragmentation profiler (notes 2.2; = profile memory)",
                            description="GPU memory fragmentation profiler: sample one device's address map.",
                            epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_memory_arguments(parser)
