"""Samplers that time operators (torch) and collectives (torch.distributed) on the user's own
hardware and write sample records (:mod:`paraplan.samples.schema`).

``records`` is the append-only journal every sampler writes through (nothing measured is lost;
a killed sweep resumes); ``grid`` the shape grids (GPUModeling's YAML, ``--for job.yaml``,
``--parts``); ``ops`` the operator sampler; ``adaptive`` the loop that picks which shapes to
measure next until a target held-out error. torch is imported inside functions only
(``pip install 'paraplan[profile]'``).
"""
