"""Safe fixes: findings -> fix plan -> fixer -> verify, every change journaled for undo.

journal (backups, manifests, undo), atomic (temp + fsync + rename, pre-flight refusals),
dynedit (in-place .dynstr edits), relink (cuda-mismatch), envleak (lazy ${VAR} in configs),
torchext (stale extension caches), plan (findings -> planned changes).
"""
