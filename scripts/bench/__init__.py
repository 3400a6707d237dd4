"""Benchmarks, each run from the repository root as ``python -m scripts.bench.<name>``:

- ``train``: training throughput of the paper configs, the 1- vs N-GPU scaling check, the resume check
  (``train_launch``, ``train_scaling``, ``train_resume`` are its parts; ``titan_reference`` is
  TorchTitan's own trainer it runs beside ours; ``summarize_runs`` tabulates runs' metrics);
- ``attention``: Parallax attention training kernels vs softmax SDPA and the published kernels;
- ``decode``: one-token decode against a KV cache;
- ``probe_cost``: the probe's cost outside the attention kernel (the input projection with and without rho);
- ``optimizers``: optimizer step time against AdamW and a forward+backward;
- ``kernel_resources``: registers, spills and shared memory of the Triton kernels compiled for sm_90;
- ``trace_summary``: where a profiled step's GPU time goes.

``results`` writes every results page's header (what, hardware, software, command, date).
This package imports nothing heavy: ``titan_reference`` must set the launch environment before torch loads.
"""
