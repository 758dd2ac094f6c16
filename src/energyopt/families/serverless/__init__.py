"""Serverless prefill/decode provisioning (CELLServe): SLO-aware joint provisioning
of prefill and decode functions per epoch, with opportunistic merging of decode
instances.

The family's parts, each importing only the shared layers and this package:

- ``spec``: the ``kind: serverless`` file and its plan;
- ``formulations``: the bound problem (``model``), the per-epoch MILP
  (``milp``) and the merge rule for decode instances (``merge``);
- ``solvers``: ``milp`` (exact, rolling horizon and LP relaxation), ``fast``
  (per-epoch sizing), ``merge`` (decode merging) and their common result;
- ``verify``: the independent verifier, which recomputes energy and attainment;
- ``sim``: the event simulation of a trace against static provisioning and
  autoscaling; ``merge_policy``: when decode instances merge; ``figures``: the
  per-option figures the simulator and the tables read; ``replay``: trace
  preparation (replicated traces, demand per epoch); ``tables``: the compiled
  provisioning table;
- ``family``: the registry entry (``ServerlessFamily``).
"""
