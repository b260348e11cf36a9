"""The ServerApp and ClientApp assembled from an algorithm and the features a run config switches on."""
