// Drives a fake Compute Engine API (tests/fakes/fake_compute.py) with Google's own
// @google-cloud/compute for Node: creates an instance template, a zonal and a regional
// managed instance group, waits for each operation with the operations clients' wait (the
// library's documented way: its insert() answers the operation, it has no promise()), gets
// the groups, resizes one, lists managed instances, deletes members with
// skipInstancesOnValidationError (and once without, on a non-member), reads a 404 and a 403
// as the library reports them, reads a member's created-by, and deletes the groups and the template.
//   node compute_client.js ORIGIN TOKEN PROJECT ZONE REGION
// ORIGIN is http://127.0.0.1:PORT. Prints one JSON line with what the library saw, or
// {"error", "stage", ...}; exit 0 either way (the test judges the answer).
//
// How the library is pointed at the fake (checked with 5.3.0, pinned in package.json, and 7.8.0):
// every v1 client defaults to the REST transport (opts.fallback = true,
// build/src/v1/*_client.js); google-gax's fallback GrpcClient takes `apiEndpoint`, `port`
// and `protocol` (build/src/fallback.js createStub: protocol defaults to 'https') and
// builds `${protocol}://${servicePath}:${port}/compute/v1/...` from the protos' HTTP rules
// (fallbackRest.js encodeRequest). `authClient` replaces Application Default Credentials: an
// OAuth2Client (google-auth-library, as google-gax bundles it) holding a fixed access token,
// whose fetch() adds "Authorization: Bearer TOKEN". It has no refresh token, so a 401/403 is
// not retried with a refresh. Every request's bytes and the decoding of every answer (JSON
// to protos, errors to GoogleError) are the library's.
'use strict';
const compute = require('@google-cloud/compute');
const {googleAuthLibrary} = require('google-gax');

let stage = 'setup';
const out = {};

function errorSummary(err) {
  return {code: err.code, message: String(err.message), httpStatusCode: err.httpStatusCode};
}

async function main() {
  const [origin, token, project, zone, region] = process.argv.slice(2);
  const url = new URL(origin);
  const auth = new googleAuthLibrary.OAuth2Client();
  auth.setCredentials({access_token: token, expiry_date: Date.now() + 3600 * 1000});
  const opts = {apiEndpoint: url.hostname, port: Number(url.port), protocol: 'http', authClient: auth};
  const templates = new compute.InstanceTemplatesClient(opts);
  const igms = new compute.InstanceGroupManagersClient(opts);
  const rigms = new compute.RegionInstanceGroupManagersClient(opts);
  const zoneOps = new compute.ZoneOperationsClient(opts);
  const regionOps = new compute.RegionOperationsClient(opts);
  const globalOps = new compute.GlobalOperationsClient(opts);
  const instances = new compute.InstancesClient(opts);

  // Polls an operation to DONE with the matching operations client's wait, as Google's
  // samples do; records every status the library decoded.
  async function finish(response) {
    let op = response.latestResponse;
    const seen = [op.status];
    while (op.status !== 'DONE') {
      if (op.zone) {
        [op] = await zoneOps.wait({project, zone: op.zone.split('/').pop(), operation: op.name});
      } else if (op.region) {
        [op] = await regionOps.wait({project, region: op.region.split('/').pop(), operation: op.name});
      } else {
        [op] = await globalOps.wait({project, operation: op.name});
      }
      seen.push(op.status);
      if (seen.length > 20) throw new Error(`operation ${op.name} not DONE after 20 waits`);
    }
    return {name: op.name, operationType: op.operationType, targetLink: op.targetLink, seen,
      error: op.error ? op.error.errors.map(e => ({code: e.code, message: e.message})) : null,
      httpErrorStatusCode: op.httpErrorStatusCode ?? null};
  }

  function group(g) {
    return {name: g.name, id: String(g.id), selfLink: g.selfLink, zone: g.zone ?? null, region: g.region ?? null,
      targetSize: g.targetSize, baseInstanceName: g.baseInstanceName, instanceTemplate: g.instanceTemplate,
      instanceGroup: g.instanceGroup,
      preservedDiskAutoDelete: g.statefulPolicy?.preservedState?.disks?.['persistent-disk-0']?.autoDelete ?? null,
      defaultActionOnFailure: g.instanceLifecyclePolicy?.defaultActionOnFailure ?? null,
      distributionZones: (g.distributionPolicy?.zones || []).map(z => z.zone.split('/').pop()),
      creationTimestamp: g.creationTimestamp, kind: g.kind};
  }

  function managed(list) {
    return list.map(m => ({name: m.name, instance: m.instance, id: String(m.id), instanceStatus: m.instanceStatus,
      currentAction: m.currentAction}));
  }

  stage = 'instanceTemplates.insert';
  let [resp] = await templates.insert({project, instanceTemplateResource: {
    name: 'trainer-template',
    description: 'spot trainer',
    properties: {
      machineType: 'g2-standard-8',
      scheduling: {provisioningModel: 'SPOT', instanceTerminationAction: 'STOP'},
      disks: [{boot: true, autoDelete: true,
        initializeParams: {sourceImage: 'projects/debian-cloud/global/images/family/debian-12'}}],
      networkInterfaces: [{network: 'global/networks/default'}],
    },
  }});
  out.templateInsert = await finish(resp);
  stage = 'instanceTemplates.get';
  const [tpl] = await templates.get({project, instanceTemplate: 'trainer-template'});
  out.template = {name: tpl.name, id: String(tpl.id), selfLink: tpl.selfLink, kind: tpl.kind,
    machineType: tpl.properties.machineType, provisioningModel: tpl.properties.scheduling.provisioningModel,
    creationTimestamp: tpl.creationTimestamp};

  stage = 'instanceGroupManagers.insert';
  [resp] = await igms.insert({project, zone, instanceGroupManagerResource: {
    name: 'zonal-mig', instanceTemplate: tpl.selfLink, targetSize: 2, baseInstanceName: 'trainer',
    instanceLifecyclePolicy: {defaultActionOnFailure: 'REPAIR'},
    statefulPolicy: {preservedState: {disks: {'persistent-disk-0': {autoDelete: 'NEVER'}}}},
  }});
  out.zonalInsert = await finish(resp);
  stage = 'regionInstanceGroupManagers.insert';
  [resp] = await rigms.insert({project, region, instanceGroupManagerResource: {
    name: 'regional-mig', instanceTemplate: `global/instanceTemplates/${tpl.name}`, targetSize: 3,
    baseInstanceName: 'rtrainer',
    distributionPolicy: {zones: [`${region}-a`, `${region}-b`, `${region}-c`].map(z => ({zone: `zones/${z}`}))},
  }});
  out.regionalInsert = await finish(resp);

  stage = 'get groups';
  out.zonal = group((await igms.get({project, zone, instanceGroupManager: 'zonal-mig'}))[0]);
  out.regional = group((await rigms.get({project, region, instanceGroupManager: 'regional-mig'}))[0]);
  stage = 'list groups';
  out.zonalList = (await igms.list({project, zone}))[0].map(g => g.name);
  out.regionalList = (await rigms.list({project, region}))[0].map(g => g.name);

  stage = 'instanceGroupManagers.resize';
  [resp] = await igms.resize({project, zone, instanceGroupManager: 'zonal-mig', size: 3});
  out.resize = await finish(resp);
  out.zonalAfterResize = (await igms.get({project, zone, instanceGroupManager: 'zonal-mig'}))[0].targetSize;

  stage = 'listManagedInstances';
  const [zm] = await igms.listManagedInstances({project, zone, instanceGroupManager: 'zonal-mig'});
  const [rm] = await rigms.listManagedInstances({project, region, instanceGroupManager: 'regional-mig'});
  out.zonalManaged = managed(zm);
  out.regionalManaged = managed(rm);

  stage = 'instanceGroupManagers.deleteInstances (skip)';
  [resp] = await igms.deleteInstances({project, zone, instanceGroupManager: 'zonal-mig',
    instanceGroupManagersDeleteInstancesRequestResource: {
      instances: [zm[0].instance, `zones/${zone}/instances/not-a-member`],
      skipInstancesOnValidationError: true,
    }});
  out.zonalDelete = await finish(resp);
  out.zonalAfterDelete = (await igms.get({project, zone, instanceGroupManager: 'zonal-mig'}))[0].targetSize;

  stage = 'instanceGroupManagers.deleteInstances (no skip, non-member)';
  [resp] = await igms.deleteInstances({project, zone, instanceGroupManager: 'zonal-mig',
    instanceGroupManagersDeleteInstancesRequestResource: {instances: [`zones/${zone}/instances/not-a-member`]}});
  out.zonalDeleteNonMember = await finish(resp);

  stage = 'regionInstanceGroupManagers.deleteInstances';
  const partial = rm[1].instance.replace(/^.*\/compute\/v1\/projects\/[^/]+\//, '');
  [resp] = await rigms.deleteInstances({project, region, instanceGroupManager: 'regional-mig',
    regionInstanceGroupManagersDeleteInstancesRequestResource: {instances: [partial],
      skipInstancesOnValidationError: true}});
  out.regionalDelete = await finish(resp);
  out.regionalAfterDelete = (await rigms.get({project, region, instanceGroupManager: 'regional-mig'}))[0].targetSize;
  out.regionalManagedAfter = managed((await rigms.listManagedInstances({project, region,
    instanceGroupManager: 'regional-mig'}))[0]);

  stage = '404';
  try {
    await igms.get({project, zone, instanceGroupManager: 'no-such-mig'});
    out.notFound = {ok: true};
  } catch (err) {
    out.notFound = errorSummary(err);
  }
  stage = 'instances.get (a member)';
  const [vm] = await instances.get({project, zone, instance: zm[1].name});
  out.memberMetadata = Object.fromEntries((vm.metadata?.items || []).map(i => [i.key, i.value]));
  stage = '403';
  try {
    await instances.stop({project, zone, instance: zm[1].name});  // the test denies compute.instances.stop
    out.forbidden = {ok: true};
  } catch (err) {
    out.forbidden = errorSummary(err);
  }
  stage = 'template in use';
  try {
    await templates.delete({project, instanceTemplate: 'trainer-template'});
    out.templateInUse = {ok: true};
  } catch (err) {
    out.templateInUse = errorSummary(err);
  }

  stage = 'delete groups';
  [resp] = await igms.delete({project, zone, instanceGroupManager: 'zonal-mig'});
  out.zonalDeleteGroup = await finish(resp);
  [resp] = await rigms.delete({project, region, instanceGroupManager: 'regional-mig'});
  out.regionalDeleteGroup = await finish(resp);
  stage = 'instanceTemplates.delete';
  [resp] = await templates.delete({project, instanceTemplate: 'trainer-template'});
  out.templateDelete = await finish(resp);
  out.templatesLeft = (await templates.list({project}))[0].map(t => t.name);
  for (const c of [templates, igms, rigms, zoneOps, regionOps, globalOps, instances]) await c.close();
  return out;
}

main().then(
  result => console.log(JSON.stringify(result)),
  err => console.log(JSON.stringify({error: String(err && err.message ? err.message : err), stage,
    code: err && err.code, partial: out})),
);
