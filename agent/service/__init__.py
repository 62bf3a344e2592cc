"""The resident agent (`seedance agent run`): one loop, small parts.

daemon.py   the loop: registry GC, periodic checks, NVML samples, probes, signals
config.py   durations, the agent's config file and where its files live (XDG)
state.py    SQLite (WAL) findings and instance history that survive restarts
api.py      the status socket (unix, 0600, same uid only)
metrics.py  Prometheus text exposition, loopback only
otlp.py     optional OTLP export (imported only when an endpoint is configured)
notify.py   sd_notify: READY/STATUS/WATCHDOG/STOPPING
unit.py     the systemd user unit that `seedance agent install --user` writes
gpu.py      NVML samples and the facts the affinity rule reads
registry.py the view of the shim's instance registry that GC needs
log.py      structured JSON log lines for stderr/journald
"""
