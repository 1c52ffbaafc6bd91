import type { Problem } from "./types.js";

/** An error answer from the server (`application/problem+json`), field by field. */
export class OverseerError extends Error implements Problem {
  readonly type: string;
  readonly title: string;
  readonly status: number;
  readonly detail: string;
  readonly field?: string;

  constructor(problem: Problem) {
    super(`${problem.status} ${problem.title}: ${problem.detail}`);
    this.name = "OverseerError";
    this.type = problem.type;
    this.title = problem.title;
    this.status = problem.status;
    this.detail = problem.detail;
    if (problem.field !== undefined) this.field = problem.field;
  }
}

/** No answer came back: the server is down, unreachable, or the request timed out. */
export class ConnectionError extends Error {
  constructor(readonly server: string, readonly cause: unknown) {
    super(`no answer from ${server}: ${cause instanceof Error ? cause.message : String(cause)}`);
    this.name = "ConnectionError";
  }
}

/** Thrown by a handler: the attempt failed and may be retried (any other throw counts the same). */
export class RetryableError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "RetryableError";
  }
}

/** Thrown by a handler: the step fails for good (reported with `retryable: false`). */
export class FatalError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "FatalError";
  }
}
