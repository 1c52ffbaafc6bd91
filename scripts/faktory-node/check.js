// A round trip through Overseer's Faktory listener with the Node client (faktory-worker):
// push, bulk push, a worker that runs and fails jobs, INFO, QUEUE PAUSE/RESUME/REMOVE, and
// MUTATE kill/requeue/clear. Run by ../faktory-node-check.sh; FAKTORY_URL names the server.
const faktory = require('faktory-worker');
const assert = require('assert');
(async () => {
  const url = process.env.FAKTORY_URL || 'tcp://127.0.0.1:7419';
  const client = await faktory.connect({ url });
  const info0 = await client.info();
  assert.ok(info0.faktory && info0.server, 'info shape');
  // push + fetch via a worker
  const seen = [];
  faktory.register('Add', async (a, b) => { seen.push(a + b); });
  faktory.register('Boom', async () => { throw new Error('boom!'); });
  const jid = await client.job('Add', 2, 3).push();
  const boom = client.job('Boom'); boom.retry = 2; await boom.push();
  // bulk
  const res = await client.pushBulk([client.job('Add', 1, 1), client.job('Add', 4, 4)]);
  console.log('pushBulk rejected:', JSON.stringify(res));
  const worker = await faktory.work({ url, queues: ['default'], concurrency: 2 });
  await new Promise(r => setTimeout(r, 1500));
  await worker.stop();
  console.log('ran', seen.sort((a,b)=>a-b));
  assert.deepStrictEqual(seen.sort((a,b)=>a-b), [2, 5, 8]);
  // queue ops
  await client.job('Add', 9, 9).push();
  const info = await client.info();
  console.log('queues', JSON.stringify(info.faktory.queues), 'tasks', Object.keys(info.faktory.tasks || {}));
  assert.strictEqual(info.faktory.queues.default, 1);
  console.log('QUEUE PAUSE', await client.send(['QUEUE', 'PAUSE', 'default']));
  console.log('QUEUE RESUME', await client.send(['QUEUE', 'RESUME', 'default']));
  console.log('QUEUE REMOVE', await client.send(['QUEUE', 'REMOVE', 'default']));
  const info2 = await client.info();
  console.log('after remove', JSON.stringify(info2.faktory.queues));
  assert.ok(!info2.faktory.queues.default, 'the queue is empty after QUEUE REMOVE');
  // mutation on retries: the Boom job failed once and sits in retries
  const n = await client.retries.ofType('Boom').kill();
  console.log('kill retries ->', n);
  const before = await client.info();
  await client.dead.ofType('Boom').requeue();
  const fetched = await client.fetch('default');
  console.log('requeued Boom fetched:', fetched && fetched.jobtype, fetched && fetched.failure && fetched.failure.message);
  assert.strictEqual(fetched.jobtype, 'Boom');
  await client.ack(fetched.jid);
  await client.dead.clear();
  console.log('mutations ok');
  await client.close();
  console.log('NODE CLIENT OK');
})().catch(e => { console.error('FAILED', e); process.exit(1); });
