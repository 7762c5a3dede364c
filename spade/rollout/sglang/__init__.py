"""The SGLang engine: a client of SGLang servers, and what runs those servers for a training job.

``engine.SGLangEngine`` (placement, retries, memory release and resume) talks to the servers
through ``http_client`` (keep-alive HTTP/1.1, server-sent events) in SGLang's native API:
``protocol`` (endpoints, errors, ``/generate``), ``control_protocol`` (the control calls' bodies
and answers) and ``tensor_payload`` (what a serialized tensor payload may name).
``deployment.SGLangDeployment`` places, launches (``launcher``) and restarts a job's servers and
syncs their weights (``weight_transport``: CUDA IPC colocated, NCCL broadcast otherwise);
``runtime_versions`` checks that trainer and servers share one torch and NCCL; ``settings`` is
the ``engine.sglang`` config section.
"""
