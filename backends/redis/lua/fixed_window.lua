-- Tollgate: fixed window (Rust reference: algorithms/src/fixed_window.rs).
--
-- This file defines the algorithm (`fixed_window`), its refund (`refund_fixed_window`,
-- see layered.lua's refund mode), its reward (`reward_fixed_window`) and
-- the charge an admitted state marks (`charge_fixed_window`). The store runs them through
-- layered.lua, which holds the KEYS/ARGV layout (one layer = one call of
-- `fixed_window`) and finds them by the algorithm's code (src/script.rs
-- generates its tables from the Rust list of built-ins).
--
--   fixed_window(limit, window_us, _, count, last, _, now, cost)
--
-- Layer ARGV: algorithm 3, cost, limit, window_us, 0.
-- State: cells {count, last µs}, stored as the string "a b"; nil: none.
--   The count belongs to the aligned window holding last.
-- Returns: allowed (boolean), limit, remaining, reset_after µs,
--   retry_after µs (-1 when admitted), and when admitted the TTL in
--   milliseconds and the next cells (a, b, c). No table is built.
-- Whether the cells are a state a fixed window writes: a count below
-- 2^53 (Rust: within_reach). Any other is data Tollgate did not write.
local function fixed_window_understood(count, _, _)
  return count < MAX_EXACT
end

local function fixed_window(limit, w, _, stored, last, _, now, cost)
  if not stored then
    stored, last = 0, now
  end
  local t = max(now, last)
  local start = t - mod(t, w)
  local count = 0
  if last >= start then
    count = stored
  end
  return counted(limit, count, cost, now, t, start + w, t, 0)
end

-- Fixed window: the count goes down only while it still counts the
-- charge's window.
local function refund_fixed_window(_, w, _, count, last, _, now, cost, at)
  if not count then
    return 0
  end
  if last < at or last - mod(last, w) ~= at - mod(at, w) then
    return 0
  end
  return give_from_count(count, cost, last, 0)
end

-- A reward: from the current window's count.
local function reward_fixed_window(p1, w, p3, count, last, c, now, units)
  return refund_fixed_window(p1, w, p3, count, last, c, now, units, last)
end

-- The charge an admitted state marks: its time.
local function charge_fixed_window(_, last, _)
  return last, 0
end
