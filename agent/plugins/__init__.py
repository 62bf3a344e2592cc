"""GPU plugins: manifests, the store, dependency resolution, the seven-layer check.

manifest.py  load + validate manifest.yaml (errors name the field and the line)
archive.py   where a plugin comes from (directory, .tar.gz, wheel, NAME-vVERSION) + safe extraction
store.py     $XDG_DATA_HOME/seedance/plugins/NAME/VERSION, atomic installs under a flock
resolve.py   ranges -> newest compatible version, each pick explained; fallback detection
install.py   validate -> resolve -> check -> stage -> commit
host.py      GPU observations (NVML, the kernel module)
verify.py    L7 facts: the three waste traps with their observable metrics
layers.py    the seven-layer check L1..L7 (`seedance check --plugin`)
bench.py     `seedance bench`: rounds through seedance.plugins.batching, pass criteria
"""
