"""Read side: chargeback analytics (usage, cost, waste) over the store, the site config and the weekly report; the store room is `store/`."""
