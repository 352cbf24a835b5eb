// Runs s3rver (https://github.com/jamhall/s3rver, pinned in package.json), an
// S3 server nobody here wrote, so spotvisor's S3 client can be checked against
// a second implementation besides tests/fakes/fake_s3.py.
//   node s3rver_serve.js [--port N] [--port-file F] [--dir D] [--bucket NAME]...
// Binds 127.0.0.1 (port 0 = a free one), keeps its objects in D (a fresh temp
// directory, removed on exit, when --dir is not given), creates each --bucket
// (default "test"), writes "PORT\n" to F atomically (temp file + rename),
// then prints "s3rver listening on 127.0.0.1:PORT". Runs until SIGTERM/SIGINT.
//
// s3rver knows exactly one key pair: access key id S3RVER, secret S3RVER
// (lib/models/account.js). It refuses other key ids (InvalidAccessKeyId) but
// does NOT verify SigV4 signatures ("Signature version 4 calculation is
// unimplemeneted", lib/middleware/authentication.js): a wrong secret passes.
// So it checks a client's request shapes and XML, not its signing; fake_s3.py
// checks signing (see tests/fakes/README.md).
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const S3rver = require('s3rver');

function parseArgs(argv) {
  const args = {port: 0, portFile: null, dir: null, buckets: []};
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i];
    const value = argv[i + 1];
    if (value === undefined) throw new Error(`${flag} needs a value`);
    if (flag === '--port') args.port = Number(value);
    else if (flag === '--port-file') args.portFile = value;
    else if (flag === '--dir') args.dir = value;
    else if (flag === '--bucket') args.buckets.push(value);
    else throw new Error(`unknown argument ${flag}`);
    i++;
  }
  if (!Number.isInteger(args.port) || args.port < 0 || args.port > 65535) {
    throw new Error('--port must be an integer 0..65535');
  }
  if (args.buckets.length === 0) args.buckets.push('test');
  return args;
}

function writeAtomic(file, text) {
  const tmp = `${file}.tmp.${process.pid}`;
  fs.writeFileSync(tmp, text);
  fs.renameSync(tmp, file);
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const ownDir = args.dir === null;
  const dir = ownDir ? fs.mkdtempSync(path.join(os.tmpdir(), 's3rver-')) : args.dir;
  const server = new S3rver({
    address: '127.0.0.1',
    port: args.port,
    silent: true,
    directory: dir,
    configureBuckets: args.buckets.map((name) => ({name})),
  });
  const {port} = await server.run();
  let stopping = false;
  const stop = async () => {
    if (stopping) return;
    stopping = true;
    await server.close();
    if (ownDir) fs.rmSync(dir, {recursive: true, force: true});
    process.exit(0);
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  // The port file first: whoever sees the line finds the file too.
  if (args.portFile) writeAtomic(args.portFile, `${port}\n`);
  console.log(`s3rver listening on 127.0.0.1:${port}`);
}

main().catch((err) => {
  console.error(`s3rver_serve: ${err && err.stack ? err.stack : err}`);
  process.exit(2);
});
