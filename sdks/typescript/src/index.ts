export { Client } from "./client.js";
export type { ClientOptions, ListOptions, CallOptions, SubmittedJob } from "./client.js";
export { Worker, localDeadline } from "./worker.js";
export type { Handler, StepContext, WorkerOptions } from "./worker.js";
export { OverseerError, ConnectionError, RetryableError, FatalError } from "./errors.js";
export type { Log } from "./reports.js";
export type * from "./types.js";
