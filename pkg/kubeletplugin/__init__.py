"""kubeletplugin."""
