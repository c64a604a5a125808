"""Text generation pieces: the KV cache, token sampling, and the model split over a tp/pp layout."""
