"""Reruns that prove: race-directed confirmation (confirm.py on the sim, confirm_gpu.py on the
GPU) and the sync audit's proof (sync_proof.py on the sim, also importable as
`streamcheck.sync_proof`; sync_proof_gpu.py on the GPU). Nothing is imported here.
"""
