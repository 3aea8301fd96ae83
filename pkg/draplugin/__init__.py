"""A driver-agnostic DRA kubelet-plugin library (the Python counterpart of upstream's
``k8s.io/dynamic-resource-allocation/kubeletplugin``).

Owns everything between the kubelet and a DRA driver that is not the driver's business:

* `server`: the ``DRAPlugin`` gRPC services (``v1`` and ``v1beta1``) on the DRA socket and the
  socket lifecycle; `registration`: the plugin-watcher ``Registration`` service;
* `resourcehealth`: device health streaming (``DRAResourceHealth`` ``v1``/``v1alpha1``);
* `health`: the gRPC liveness/readiness service (probes the sockets like the kubelet);
* `slices`: a ResourceSlice publisher for one node that takes the driver's device data;
* `claims` and `fanout`: validating the kubelet's claim references, fetching the ResourceClaim
  objects (UID and allocation checked), and the parallel Prepare/Unprepare fan-out that hands
  whole claims to a driver's `fanout.ClaimDriver`; `errors`: the per-claim error taxonomy;
* `client`: the kubelet's side of all of it, shared by the liveness probe, the kubelet stand-in
  (``hack/kubeletsim``) and the tests; ``proto``: the kubelet's .proto files and their
  generated stubs (``hack/gen-proto.sh``).

Boundary (enforced by import-linter): nothing here imports ``pkg.api`` or any driver
(``pkg.kubeletplugin``); driver names, device names and config formats come in as data.
"""
