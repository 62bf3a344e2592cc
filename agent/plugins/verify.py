"""Facts about a plugin's manifest (layer L7): what the three waste-trap rules and the
manifest rules in rules/plugins.yaml judge.

Facts never judge; they carry the observable metric of each trap as the notes' table names
it, measured where live data exists (NVML, the last `seedance bench` of the plugin) and
otherwise marked "not observed" with the reason.
"""
from __future__ import annotations

from ..model.report import Fact
from .host import GpuHost, affinity_metric
from .manifest import Manifest, has_upper_bound
from .resolve import Pick, seedance_compatible
from .store import bench_result

SOURCE = "seedance.plugins.verify"
FALLBACK_METRIC = "`seedance plugin list` shows (fallback) in the version column"
BATCH_METRIC = "many idle context switches; P99 is high at low load"


def subject(manifest: Manifest) -> dict:
    return {"plugin": manifest.name, "version": manifest.version, "path": str(manifest.root)}


def manifest_facts(manifest: Manifest, host: GpuHost, strict: bool, picks=None,
                   bench: dict | None = None) -> list:
    """picks: the dependency picks to judge (active_picks for an installed plugin); None when
    dependencies were not resolved (--no-deps), so no range is called unresolved."""
    facts = [affinity_fact(manifest, host, strict)]
    facts.extend(range_facts(manifest, picks))
    facts.append(batch_fact(manifest, bench if bench is not None else bench_result(manifest.root)))
    ok, ours = seedance_compatible(manifest)
    facts.append(Fact("plugin_compat", subject(manifest),
                      {"seedance_range": manifest.seedance_version, "seedance": ours, "compatible": ok,
                       "line": manifest.line_of("seedance_version") or 0}, SOURCE))
    return facts


def affinity_fact(manifest: Manifest, host: GpuHost, strict: bool) -> Fact:
    metric = affinity_metric(host)
    return Fact("plugin_affinity", subject(manifest), {
        "device_affinity": manifest.device_affinity or "",
        "affinity_set": bool(manifest.device_affinity),
        "device_count": host.device_count,
        "device_source": host.device_source,
        # A plugin travels between hosts: --strict judges the manifest, not this host.
        "strict": strict,
        "metric": metric["metric"],
        "metric_value": metric["value"],
        "metric_observed": metric["observed"],
        "line": manifest.line_of("device_affinity") or 0,
    }, SOURCE)


def range_facts(manifest: Manifest, picks) -> list:
    facts = []
    checked = picks is not None
    picks = picks or []
    ranges = [("seedance_version", manifest.seedance_version)]
    ranges += [(f"depends.{name}", text) for name, text in sorted(manifest.depends.items())]
    if manifest.torch_range:
        ranges.append(("framework.torch", manifest.torch_range))
    by_name = {p.name: p for p in picks}
    for field_name, text in ranges:
        pick: Pick | None = by_name.get(field_name.split(".", 1)[1]) if field_name.startswith("depends.") else None
        fallback = bool(pick and pick.fallback)
        bounded = has_upper_bound(text)
        if fallback:
            marker = f"(fallback) shown for {pick.name} {pick.version}"
        elif pick is not None and not bounded:
            marker = ("not shown: the pick is the newest known version today; an unbounded range "
                      "gives no guarantee for tomorrow's releases")
        elif not bounded:
            marker = (f"not shown: `plugin list` marks dependency picks; {field_name} has no upper "
                      f"bound, so any future release is accepted")
        else:
            marker = "not shown"
        reasons = [] if bounded else ["has no upper bound"]
        if fallback:
            reasons.append(f"picked {pick.name} {pick.version}, older than the newest {pick.newest} (fallback)")
        facts.append(Fact("plugin_range", subject(manifest), {
            "field": field_name,
            "range": text,
            "upper_bound": bounded,
            "reason": "; ".join(reasons) or "is bounded",
            "pick": (pick.version if pick else None) or "",
            "newest": (pick.newest if pick else None) or "",
            "fallback": fallback,
            "deps_checked": checked,
            "explanation": pick.explanation if pick else "",
            "metric": FALLBACK_METRIC,
            "list_marker": marker,
            # `plugin list` is computed here from the same picks, so this metric is always observed
            "metric_value": marker,
            "metric_observed": True,
            "line": manifest.line_of(field_name) or 0,
        }, SOURCE))
    return facts


def batch_fact(manifest: Manifest, bench: dict) -> Fact:
    data = {
        "policy": manifest.batch.policy or "missing",
        "declared": manifest.batch.declared,
        "max_batch_size": manifest.batch.max_batch_size,
        "max_wait_ms": manifest.batch.max_wait_ms,
        "metric": BATCH_METRIC,
        "line": manifest.line_of("batch_policy") or 0,
    }
    low = (bench or {}).get("rates", {}).get("low") if bench else None
    if low:
        data["metric_observed"] = True
        data["metric_value"] = (f"measured by seedance bench ({bench.get('policy')}): P99 at low load "
                                f"{low['p99_ms']:.2f} ms, {low['idle_waits']} idle waits for a fuller "
                                f"batch, {low['ctx_switches_voluntary']} voluntary context switches")
        data["p99_low_load_ms"] = low["p99_ms"]
    else:
        data["metric_observed"] = False
        data["metric_value"] = (f"not observed: no bench result; run `seedance bench --plugin "
                                f"{manifest.name} --profile latency-throughput --warmup 3`")
    return Fact("plugin_batch", subject(manifest), data, SOURCE)

