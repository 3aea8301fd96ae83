"""The fake API server's internals: store, selectors, patches, watch streaming and HTTP."""
