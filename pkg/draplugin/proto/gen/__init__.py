"""Generated gRPC stubs (hack/gen-proto.sh); do not edit."""
