"""Who uses a GPU: a process id resolved to its owner (a Kubernetes pod, a Slurm job, the host).

:mod:`.cgroup` reads the owner from a process's cgroup path (pure), :mod:`.proc` reads
``/proc`` (bounded, cached per PID, a stated reason where it cannot), :mod:`.usage` adds up
one GPU's processes per owner, exactly once per (owner, physical GPU). The NVML source is
its one user; nothing here imports a source, the exposition or NVML.
"""
