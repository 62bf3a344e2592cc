"""WorkloadQuotaPolicy (product notes 2.4): policies, cgroup backends and the PSI burst controller.

policy.py   parse and validate the YAML policy (one line naming the field on error)
cgroups.py  enforce with the kernel's own cgroup files (v1 cpu/memory, or v2 cpu.max/memory.*)
psi.py      read pressure stall information (the cgroup's own where present, else /proc/pressure)
workloads.py find labelled workloads (`seedance run --label`) among running processes
controller.py apply policies to workloads, burst them while pressure is low, and undo it all
"""
