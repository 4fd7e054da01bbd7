"""Policies over the analytics: fairshare factors and the recommender that turns usage into scheduler advice."""
