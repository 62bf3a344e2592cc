"""A standing attack suite (issue 10): each defect found becomes a test here."""
