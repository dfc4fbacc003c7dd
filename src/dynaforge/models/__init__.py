"""Neural models: surrogates and the N-body step controller (`dt_predictor`)."""
