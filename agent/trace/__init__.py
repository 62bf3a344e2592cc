"""seedance.trace: live tracing of loads, loader errors and CUDA memory.

env      -- can eBPF run here, and if not, the one-line reason
events   -- TraceEvent: what the probes (or the LD_AUDIT fallback) report
session  -- the eBPF session: attach, stream, detach cleanly
facts    -- events -> Facts for the same rule engine as `seedance check`
audit    -- the fallback: launch a command under the shim's LD_AUDIT module
"""
