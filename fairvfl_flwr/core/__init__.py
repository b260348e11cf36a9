"""The algorithm in numpy and torch only: the objective, the constraints, the models, the steps."""
