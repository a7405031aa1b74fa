"""The GCS emulator (gcp-storage-emulator) behind the `fake_bucket` fixture (harness/fixtures.py) and the tests of
remote paths.

Production behaviour changed: `probe_afresh` monkeypatches bert_jax.object_stores' module caches (what it learnt of
buckets, objects and writable paths, the paths it warned about) to empty ones for the test.
`emulator_read_with_generation` wraps the emulator's read handlers, not the library's.
"""


def probe_afresh(monkeypatch):
  """What object_stores learnt of buckets and objects in earlier tests (another emulator on the same port), and the
  paths it warned about, is forgotten."""
  from bert_jax import object_stores  # pylint: disable=g-import-not-at-top
  for name, empty in (('_ACCESS', {}), ('_OBJECTS', {}), ('_WRITABLE', {}), ('_WARNED', set())):
    monkeypatch.setattr(object_stores, name, empty)


def emulator_read_with_generation(handler):
  """The GCS emulator's object read, with the generation header GCS sends (x-goog-generation), which tensorstore
  reads to tell object versions apart (without it: 'Malformed StorageGeneration')."""
  def read(request, response, storage, *args, **kwargs):
    handler(request, response, storage, *args, **kwargs)
    try:
      response['x-goog-generation'] = storage.get_file_obj(request.params['bucket_name'],
                                                           request.params['object_id'])['generation']
    except Exception:  # pylint: disable=broad-except  (no such object: the handler's 404 stands)
      pass
  return read
