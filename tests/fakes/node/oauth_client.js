// Gets an access token with Google's google-auth-library (Node), the way an
// application using Application Default Credentials does, from a key file
// whose token endpoint is a fake (tests/fakes/fake_oauth.py).
//   node oauth_client.js KEY_FILE
// Prints {"token": ...} or {"error": ...} as one JSON line; exit 0 either way
// (the test judges the answer).
//
// The library posts a service-account assertion to Google's token URL, fixed
// in its code (gtoken), and an authorized_user refresh to its
// `endpoints.oauth2TokenUrl`. Only the address is changed here, to the key
// file's token_uri: every byte of the request (form, JWT, signature) and the
// reading of the answer are the library's.
'use strict';
const fs = require('fs');
const {GoogleAuth} = require('google-auth-library');

const GOOGLE_TOKEN_URL = 'https://oauth2.googleapis.com/token';

async function main() {
  const keyFile = process.argv[2];
  const tokenUri = JSON.parse(fs.readFileSync(keyFile, 'utf8')).token_uri;
  const auth = new GoogleAuth({
    keyFile,
    scopes: ['https://www.googleapis.com/auth/devstorage.read_only'],
    clientOptions: {endpoints: {oauth2TokenUrl: tokenUri}},
  });
  const client = await auth.getClient();
  client.transporter.interceptors.request.add({
    resolved: async config => {
      // gaxios has made the URL a URL object by now, and its error path expects one.
      if (String(config.url) === GOOGLE_TOKEN_URL) config.url = new URL(tokenUri);
      return config;
    },
  });
  const {token} = await client.getAccessToken();
  return token;
}

main().then(
  token => console.log(JSON.stringify({token})),
  err => console.log(JSON.stringify({error: String(err && err.message ? err.message : err)})),
);
