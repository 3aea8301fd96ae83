"""The ComputeDomain controller: reconcilers for ComputeDomains (dependents, status, deletion),
ResourceClaims (node domain labels) and clique node labels, the generic controller loop, the
orphan sweep, and the wiring/flags/app of the compute-domain-controller binary."""
