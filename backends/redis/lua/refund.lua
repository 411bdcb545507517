-- Tollgate: refunds (Rust reference: each algorithm's `*_refund` in algorithms/src/, dispatched by algorithms/src/refund.rs).
--
-- This file defines one function per algorithm; the store runs them through
-- layered.lua in its 'refund' mode (Redis Cluster: a request whose layers
-- span several hash slots reserves slot by slot, and gives back what it
-- reserved when a later slot denies).
--
--   refund_<algorithm>(p1, p2, p3, state, now, cost, at, mark)
--
-- at    the effective time (µs) the reservation charged at;
-- mark  token bucket: the scaled level the charge left; GCRA: the TAT it
--       wrote; otherwise 0.
-- Returns: what was given back (scaled tokens, µs of TAT, counts, log
--   entries; 0 when nothing), and for counter states the cells to store
--   (nil: write nothing).
--
-- A refund never gives back more than the charge took, and never more than
-- the state would hold had the charge not happened: between the charge and
-- the refund, other requests may have been admitted against the charged
-- state, and a bucket that would have been full meanwhile wastes refill.
-- When that cannot be ruled out the refund gives back less (or nothing):
-- a brief under-admission, never an over-admission. A state whose time is
-- before the charge's was recreated since (it expired): nothing to refund.

-- Token bucket. Without the charge the bucket held `cost × period` more
-- at `at`; it can only have wasted refill (by being full) after
-- (full − left − cost × period) / refill, so after `elapsed` it holds at
-- least min(cost × period, full − left − elapsed × refill) more.
local function refund_token_bucket(capacity, refill, period, cells, now, cost, at, left)
  if not cells then
    return 0
  end
  local full = capacity * period
  local stored, last = math.min(cells[1], full), cells[2]
  if last < at or left >= full then
    return 0
  end
  local elapsed = math.max(now, last) - at
  local room = full - left
  -- Compared first so the product stays below 2^53.
  if elapsed >= cdiv(room, refill) then
    return 0
  end
  local give = math.min(cost * period, room - elapsed * refill)
  give = math.min(give, full - stored)
  if give <= 0 then
    return 0
  end
  return give, { stored + give, last, 0 }
end

-- GCRA. The charge moved the TAT `cost × interval` later, to `tat_after`;
-- without it the TAT could have been raised to the effective time since,
-- so only what is still ahead of the effective time goes back, and the TAT
-- never goes below the effective time.
local function refund_gcra(burst, interval, _, cells, now, cost, at, tat_after)
  if not cells then
    return 0
  end
  local tat, last = cells[1], cells[2]
  if last < at then
    return 0
  end
  local t = math.max(now, last)
  local give = math.min(cost * interval, tat_after - t)
  if give <= 0 then
    return 0
  end
  local lowered = math.max(tat - give, t)
  if lowered >= tat then
    return 0
  end
  return tat - lowered, { lowered, last, 0 }
end

-- Fixed window: the count goes down only while it still counts the
-- charge's window.
local function refund_fixed_window(_, w, _, cells, now, cost, at)
  if not cells then
    return 0
  end
  local count, last = cells[1], cells[2]
  if last < at or last - mod(last, w) ~= at - mod(at, w) then
    return 0
  end
  local give = math.min(cost, count)
  if give <= 0 then
    return 0
  end
  return give, { count - give, last, 0 }
end

-- Sliding window counter: the charge is in the current count while the
-- state is in the charge's window, and in the previous count once the state
-- has moved to the next window; later than that it no longer counts.
local function refund_sliding_window(_, w, _, cells, now, cost, at)
  if not cells then
    return 0
  end
  local cur, prev, last = cells[1], cells[2], cells[3]
  if last < at then
    return 0
  end
  local start, charged = last - mod(last, w), at - mod(at, w)
  if start == charged then
    local give = math.min(cost, cur)
    if give <= 0 then
      return 0
    end
    return give, { cur - give, prev, last }
  elseif start == charged + w then
    local give = math.min(cost, prev)
    if give <= 0 then
      return 0
    end
    return give, { cur, prev - give, last }
  end
  return 0
end

-- Sliding log: the charge appended `cost` entries equal to `at`; entries
-- equal to `at` are interchangeable and age out together, so removing up
-- to `cost` of them (newest first) removes exactly the charge's, or nothing
-- once they aged out.
local function refund_sliding_log(key, cost, at)
  local removed = redis.pcall('LREM', key, -cost, int(at))
  if type(removed) ~= 'number' then
    return 0
  end
  return removed
end
