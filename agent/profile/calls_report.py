"""Profile a plugin's bench callable and turn its redundant paths into facts."""
from __future__ import annotations

import types
from pathlib import Path

from ..model.report import Fact
from .callgraph import CallGraph, merge_text, profile_call


def load_plugin_manifest(request: str):
    """A plugin directory, or an installed NAME / NAME-vVERSION (as `seedance bench`)."""
    from ..plugins import archive
    from ..plugins.manifest import MANIFEST_NAME, load_manifest
    from ..plugins.store import Store

    if Path(request).is_dir():
        return load_manifest(Path(request) / MANIFEST_NAME)
    name, version = archive.split_request(request)
    return Store().get(name, version).manifest


def profile_plugin(request: str, batch_size: int):
    from ..plugins.bench import load_bench_callable

    manifest = load_plugin_manifest(request)
    handler = load_bench_callable(manifest)
    module = types.SimpleNamespace(**handler.__globals__)
    batch = list(range(batch_size))
    graph = profile_call(handler, batch, [str(manifest.root)], modules=[module])
    return manifest, graph


def callgraph_facts(manifest, graph: CallGraph, batch_size: int) -> list[Fact]:
    facts = []
    for r in graph.redundancies:
        data = r.to_dict()
        data.update(path_a_text=" -> ".join(r.path_a), path_b_text=" -> ".join(r.path_b),
                    merge=merge_text(r), input=f"batch of {batch_size}", plugin=manifest.name,
                    version=manifest.version)
        facts.append(Fact("plugin_redundant_path", {"plugin": manifest.name, "version": manifest.version},
                          data, source="profile.callgraph"))
    return facts
