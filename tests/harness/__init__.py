"""The tests' shared functions, one module per purpose (tests/ is on the path: `from harness.inputs import ...`).

Each module's docstring says what it is for and which production behaviour it changes:
  numerics      tolerances for float comparisons, a module's call jitted: changes none
  inputs        the repository's paths, tiny configs, corpora, task files, retrieval data, tokenizers trained here,
                the MiniLM package and the shared data sets: changes none
  digests       what a run left on disk read back (digests, a PNG's size, a checkpoint's state), files cut short, a
                small tmpfs: changes none
  entry_points  experiments/ entry points run by a test: run_main runs one's __main__ in the test process (deletes
                absl flags, chdirs, redirects sys.stdout/stderr and dup2s file descriptors 1 and 2)
  processes     processes of their own (jax.distributed on localhost, an entry point after a patch): changes none in
                the test process
  faults        kills and signals injected by patching the library (Checkpointer.save, the loaders' batches)
  references    comparisons with transformers and reference implementations: changes none beyond run_main's
  gcs_emulator  the GCS emulator's helpers: resets object_stores' module caches for a test
  fixtures      the shared fixtures (a pytest plugin of tests/conftest.py): build shared read-only runs once per
                test run
"""
