// Drives a fake Cloud Storage (tests/fakes/fake_gcs.py) with Google's own
// @google-cloud/storage for Node: uploads files (multipart, one-request
// resumable, chunked resumable), composes them with bucket.combine() (which
// sends objects.compose), downloads the result with the library's CRC32C
// validation on, asks for MD5 validation (which a composite object cannot
// give), reads a range, and lists.
//   STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT node gcs_client.js BUCKET OUT_FILE FILE...
// Prints one JSON line with what the library saw, or {"error", "stage"};
// exit 0 either way (the test judges the answer). OUT_FILE gets the
// downloaded composite.
//
// How v7 reads STORAGE_EMULATOR_HOST (checked in 7.22.0,
// build/cjs/src/storage.js): the value is the JSON API base URL verbatim
// (baseUrl = STORAGE_EMULATOR_HOST, so it must end in /storage/v1), and the
// same value is the root for uploads (apiEndpoint + /upload/storage/v1/...).
// No single spelling serves both against a server with GCS's paths, so the
// script sets the variable to ORIGIN/storage/v1 and passes ORIGIN as
// apiEndpoint. Either way the library treats it as a custom endpoint and
// sends no credentials. Every request and the checks on every answer are
// the library's.
'use strict';
const crypto = require('crypto');
const fs = require('fs');
const path = require('path');

const origin = (process.env.STORAGE_EMULATOR_HOST || '').replace(/\/+$/, '').replace(/\/storage\/v1$/, '');
process.env.STORAGE_EMULATOR_HOST = `${origin}/storage/v1`;
const {Storage} = require('@google-cloud/storage');

let stage = 'setup';

function summary(meta) {
  const keep = ['name', 'size', 'generation', 'crc32c', 'md5Hash', 'componentCount', 'contentType', 'metadata'];
  return Object.fromEntries(keep.filter(k => meta[k] !== undefined).map(k => [k, meta[k]]));
}

async function main() {
  const [bucketName, outFile, ...files] = process.argv.slice(2);
  const storage = new Storage({apiEndpoint: origin, projectId: 'fake-project'});
  const bucket = storage.bucket(bucketName);
  const out = {uploaded: []};

  // Three upload paths: multipart, one-request resumable, 256 KiB chunks.
  const ways = [{resumable: false}, {resumable: true}, {resumable: true, chunkSize: 256 * 1024}];
  const parts = [];
  for (const [i, file] of files.entries()) {
    stage = `upload ${path.basename(file)}`;
    const [f] = await bucket.upload(file, {destination: `parts/${path.basename(file)}`, ...ways[i % ways.length]});
    parts.push(f);
    out.uploaded.push(summary(f.metadata));
  }

  stage = 'combine';
  const dest = bucket.file('combined.bin');
  dest.metadata.contentType = 'application/x-checkpoint';
  const [combined] = await bucket.combine(parts, dest);
  stage = 'getMetadata';
  const [meta] = await combined.getMetadata();
  out.combined = summary(meta);

  stage = 'download (crc32c validation)';
  await combined.download({destination: outFile, validation: 'crc32c'});
  const bytes = fs.readFileSync(outFile);
  out.download = {size: bytes.length, sha256: crypto.createHash('sha256').update(bytes).digest('hex')};

  stage = 'download (md5 validation)';
  try {
    await combined.download({validation: 'md5'});
    out.md5_download = {ok: true};
  } catch (err) {
    out.md5_download = {code: err.code, message: String(err.message)};
  }

  stage = 'range download';
  const [range] = await combined.download({start: 10, end: 19});
  out.range = range.toString('hex');

  stage = 'list';
  const [listed] = await bucket.getFiles();
  out.listed = listed.map(f => summary(f.metadata));
  return out;
}

main().then(
  out => console.log(JSON.stringify(out)),
  err => console.log(JSON.stringify({error: String(err && err.message ? err.message : err), stage})),
);
