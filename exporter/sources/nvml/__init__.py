"""The nvml source: this machine's GPUs through NVML (source.py, options in options.py),
and in node mode the kubelet's PodResources (podresources.py, the gRPC client; pods.py, the
join of its answer onto the GPUs by UUID; podresources_v1/, generated from the kubelet's proto)."""
