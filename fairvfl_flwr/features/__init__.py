"""Optional round features, each a plug-in (round hook, ν channel, client mod, handlers), independent of each other."""
