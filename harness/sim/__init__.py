"""SIMULATION ONLY -- a GPU-free test harness, not product code.

Nothing in the operator imports this package. It stands in for what the local API server lacks
(see harness.devcluster): the StatefulSet controller, the kubelet and the SGLang runtime.

- ``engine``: an HTTP stand-in for ``sglang.launch_server`` with the runtime's contract
  (/health, /ready, /metrics names, /flush_cache with the admin key, /generate with
  ``cached_tokens_details``) whose disk tier is the real ``HiCacheFile`` of the pinned wheel.
- ``cluster``: ``SimCluster`` plays the node side of the real control plane: binds claims to host directories and
  runs the pods bound to its nodes on loopback pod IPs (``kubelet``), every container from its built image
  with runc (``containers``; the images: ``images`` and harness/images).
- ``sglang_tree``: fetches the pinned sglang wheel and applies the runtime patch series.
- ``runtime_code``: the runtime's own storage-backup, shutdown-release and flush-idle code, compiled out
  of a tree's source (its modules take ~14 s to import on CPU).
"""
