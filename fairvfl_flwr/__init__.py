"""Fair models in vertical federated learning (FairVFL) as a Flower app; one folder per layer."""
