"""One router per area: pages, the plan API, the models API, uploads."""
