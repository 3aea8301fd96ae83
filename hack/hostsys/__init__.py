"""Host facilities shared by the hack packages: qemu-user binfmt handlers (`hostsys.binfmt`) and
free loopback ports (`hostsys.ports`).

The kubelet stand-in (`kubeletsim`), the local cluster (`localcluster`) and the image tooling
(`nodeimages`) are independent of each other (import contracts in `hack/.importlinter`); what
more than one of them needs from the host lives here, below all three, and imports none of them.
"""
