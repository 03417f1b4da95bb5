"""The families of "write a function" tasks: each a reference solution, unit tests, the names it
trains under and one name kept for the held-out split, argument names and descriptions.

A solution is the function body (indented by four) or, for a class, the whole class; `{name}`
is the function or class name and `{0}`, `{1}`, ... the argument names. Tests are statements that
call `{name}` and raise when the answer is wrong. Families span arithmetic, strings, lists, dicts,
recursion and small classes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    key: str
    names: tuple[str, ...]  # names the training tasks use
    held_out_name: str  # never in training: the held-out prompt's name
    args: tuple[tuple[str, ...], ...]  # alternative argument-name tuples
    descs: tuple[str, ...]  # one-sentence descriptions over {0}, {1}, ...
    body: str
    tests: tuple[str, ...]
    is_class: bool = False


N1 = (("n",), ("x",), ("num",), ("value",), ("number",))
AB = (("a", "b"), ("x", "y"), ("m", "n"), ("first", "second"), ("p", "q"))
S1 = (("s",), ("text",), ("string",), ("word",))
S2 = (("s", "t"), ("a", "b"), ("first", "second"), ("word1", "word2"))
L1 = (("xs",), ("items",), ("values",), ("nums",), ("numbers",), ("lst",))
LT = (("xs", "target"), ("items", "item"), ("values", "x"), ("nums", "value"), ("lst", "needle"))
D1 = (("d",), ("mapping",), ("table",), ("counts",))
DD = (("a", "b"), ("d1", "d2"), ("first", "second"), ("left", "right"))
DK = (("d", "key"), ("mapping", "k"), ("table", "name"), ("data", "field"))
SC = (("s", "ch"), ("text", "char"), ("word", "letter"), ("string", "c"))
SP = (("s", "prefix"), ("text", "start"), ("word", "head"), ("string", "begin"))
SN = (("s", "n"), ("text", "times"), ("word", "count"), ("string", "k"))
XR = (("x", "low", "high"), ("value", "lo", "hi"), ("n", "minimum", "maximum"))


def _f(key, names, held, args, descs, body, *tests) -> Family:
    return Family(key, tuple(names), held, args, tuple(descs), body, tests)


def _c(key, names, held, descs, body, *tests) -> Family:
    return Family(key, tuple(names), held, ((),), tuple(descs), body, tests, is_class=True)


ARITHMETIC = (
    _f("is_even", ["is_even", "check_even", "is_even_number", "even"], "is_divisible_by_two", N1,
       ["Return True when {0} is even.", "Check whether {0} is even.",
        "Return whether the integer {0} is even."],
       "    return {0} % 2 == 0",
       "assert {name}(4) is True", "assert {name}(7) is False", "assert {name}(0) is True",
       "assert {name}(-3) is False"),
    _f("is_odd", ["is_odd", "check_odd", "odd"], "is_uneven", N1,
       ["Return True when {0} is odd.", "Check whether {0} is odd."],
       "    return {0} % 2 == 1",
       "assert {name}(3) is True", "assert {name}(8) is False", "assert {name}(-5) is True"),
    _f("square", ["square", "squared", "sq"], "square_of", N1,
       ["Return the square of {0}.", "Return {0} multiplied by itself."],
       "    return {0} * {0}",
       "assert {name}(3) == 9", "assert {name}(-4) == 16", "assert {name}(0) == 0"),
    _f("cube", ["cube", "cubed", "third_power"], "cube_of", N1,
       ["Return the cube of {0}.", "Return {0} to the third power."],
       "    return {0} ** 3",
       "assert {name}(2) == 8", "assert {name}(-3) == -27", "assert {name}(1) == 1"),
    _f("double", ["double", "twice", "times_two"], "doubled", N1,
       ["Return {0} multiplied by 2.", "Return twice {0}."],
       "    return {0} * 2",
       "assert {name}(5) == 10", "assert {name}(-1) == -2", "assert {name}(0) == 0"),
    _f("half", ["half", "halve", "divide_by_two"], "split_in_half", N1,
       ["Return {0} divided by 2 as a float.", "Return half of {0}."],
       "    return {0} / 2",
       "assert {name}(5) == 2.5", "assert {name}(8) == 4", "assert {name}(-3) == -1.5"),
    _f("absolute", ["absolute", "abs_value", "absolute_value"], "magnitude", N1,
       ["Return the absolute value of {0}.", "Return {0} without its sign."],
       "    return {0} if {0} >= 0 else -{0}",
       "assert {name}(-7) == 7", "assert {name}(3) == 3", "assert {name}(0) == 0"),
    _f("is_positive", ["is_positive", "positive", "check_positive"], "greater_than_zero", N1,
       ["Return True when {0} is greater than zero.", "Check whether {0} is positive."],
       "    return {0} > 0",
       "assert {name}(5) is True", "assert {name}(0) is False", "assert {name}(-2) is False"),
    _f("is_negative", ["is_negative", "negative", "check_negative"], "below_zero", N1,
       ["Return True when {0} is less than zero.", "Check whether {0} is negative."],
       "    return {0} < 0",
       "assert {name}(-5) is True", "assert {name}(0) is False", "assert {name}(2) is False"),
    _f("sign", ["sign", "signum", "sign_of"], "get_sign", N1,
       ["Return 1 if {0} is positive, -1 if it is negative and 0 otherwise.",
        "Return the sign of {0}: 1, -1 or 0."],
       "    if {0} > 0:\n        return 1\n    if {0} < 0:\n        return -1\n    return 0",
       "assert {name}(9) == 1", "assert {name}(-2) == -1", "assert {name}(0) == 0"),
    _f("add", ["add", "add_numbers", "sum_two", "plus"], "combine_sum", AB,
       ["Return the sum of {0} and {1}.", "Add {0} and {1} and return the result."],
       "    return {0} + {1}",
       "assert {name}(2, 3) == 5", "assert {name}(-1, 1) == 0", "assert {name}(10, 32) == 42"),
    _f("subtract", ["subtract", "minus", "difference"], "take_away", AB,
       ["Return {0} minus {1}.", "Subtract {1} from {0} and return the result."],
       "    return {0} - {1}",
       "assert {name}(5, 3) == 2", "assert {name}(1, 4) == -3", "assert {name}(0, 0) == 0"),
    _f("multiply", ["multiply", "mul", "times"], "multiply_pair", AB,
       ["Return the product of {0} and {1}.", "Multiply {0} by {1} and return the result."],
       "    return {0} * {1}",
       "assert {name}(4, 5) == 20", "assert {name}(-2, 3) == -6", "assert {name}(7, 0) == 0"),
    _f("max_of", ["max_of", "maximum", "larger", "bigger"], "greater_of", AB,
       ["Return the larger of {0} and {1}.", "Return whichever of {0} and {1} is bigger."],
       "    return {0} if {0} >= {1} else {1}",
       "assert {name}(3, 9) == 9", "assert {name}(10, 2) == 10", "assert {name}(-1, -5) == -1"),
    _f("min_of", ["min_of", "minimum", "smaller", "lesser"], "lesser_of", AB,
       ["Return the smaller of {0} and {1}.", "Return whichever of {0} and {1} is smaller."],
       "    return {0} if {0} <= {1} else {1}",
       "assert {name}(3, 9) == 3", "assert {name}(10, 2) == 2", "assert {name}(-1, -5) == -5"),
    _f("average_two", ["average", "mean_of_two", "avg"], "midpoint", AB,
       ["Return the average of {0} and {1}.", "Return the mean of the two numbers {0} and {1}."],
       "    return ({0} + {1}) / 2",
       "assert {name}(2, 4) == 3", "assert {name}(1, 2) == 1.5", "assert {name}(-3, 3) == 0"),
    _f("is_divisible", ["is_divisible", "divides", "divisible_by"], "is_multiple_of", AB,
       ["Return True when {0} is divisible by {1}.", "Check whether {1} divides {0} evenly."],
       "    return {0} % {1} == 0",
       "assert {name}(10, 5) is True", "assert {name}(10, 3) is False",
       "assert {name}(0, 7) is True"),
    _f("power", ["power", "pow_of", "raise_to"], "exponent", AB,
       ["Return {0} raised to the power {1}.", "Return {0} to the power of {1}."],
       "    return {0} ** {1}",
       "assert {name}(2, 10) == 1024", "assert {name}(5, 0) == 1", "assert {name}(-3, 3) == -27"),
    _f("factorial", ["factorial", "fact", "compute_factorial"], "factorial_of", N1,
       ["Return the factorial of {0}.", "Return {0}! computed recursively."],
       "    if {0} <= 1:\n        return 1\n    return {0} * {name}({0} - 1)",
       "assert {name}(0) == 1", "assert {name}(5) == 120", "assert {name}(10) == 3628800"),
    _f("fibonacci", ["fibonacci", "fib", "nth_fibonacci"], "fibonacci_number", N1,
       ["Return the Fibonacci number at index {0}, where the sequence starts 0, 1, 1, 2.",
        "Return the {0}-th Fibonacci number (starting from 0 and 1)."],
       "    a, b = 0, 1\n    for _ in range({0}):\n        a, b = b, a + b\n    return a",
       "assert {name}(0) == 0", "assert {name}(1) == 1", "assert {name}(10) == 55"),
    _f("sum_to", ["sum_to", "sum_up_to", "triangular"], "sum_first_n", N1,
       ["Return the sum of the integers from 1 to {0}.", "Add up all whole numbers from 1 to {0}."],
       "    return {0} * ({0} + 1) // 2",
       "assert {name}(1) == 1", "assert {name}(10) == 55", "assert {name}(0) == 0"),
    _f("gcd", ["gcd", "greatest_common_divisor", "highest_common_factor"], "common_divisor", AB,
       ["Return the greatest common divisor of {0} and {1}.",
        "Return the largest integer that divides both {0} and {1}."],
       "    while {1}:\n        {0}, {1} = {1}, {0} % {1}\n    return {0}",
       "assert {name}(12, 18) == 6", "assert {name}(7, 5) == 1", "assert {name}(10, 0) == 10"),
    _f("is_prime", ["is_prime", "check_prime", "prime"], "is_prime_number", N1,
       ["Return True when {0} is a prime number.", "Check whether {0} is prime."],
       "    if {0} < 2:\n        return False\n    i = 2\n    while i * i <= {0}:\n"
       "        if {0} % i == 0:\n            return False\n        i += 1\n    return True",
       "assert {name}(2) is True", "assert {name}(15) is False", "assert {name}(13) is True",
       "assert {name}(1) is False"),
    _f("digit_sum", ["digit_sum", "sum_digits", "sum_of_digits"], "add_digits", N1,
       ["Return the sum of the decimal digits of {0}.", "Add up the digits of the integer {0}."],
       "    return sum(int(c) for c in str(abs({0})))",
       "assert {name}(123) == 6", "assert {name}(0) == 0", "assert {name}(-45) == 9"),
    _f("count_digits", ["count_digits", "num_digits", "digit_count"], "number_length", N1,
       ["Return how many decimal digits {0} has.", "Return the number of digits in {0}."],
       "    return len(str(abs({0})))",
       "assert {name}(12345) == 5", "assert {name}(0) == 1", "assert {name}(-70) == 2"),
    _f("clamp", ["clamp", "clip", "bound"], "limit_to_range", XR,
       ["Return {0} limited to the range from {1} to {2}.",
        "Clamp {0} so that it lies between {1} and {2}."],
       "    return max({1}, min({0}, {2}))",
       "assert {name}(5, 0, 10) == 5", "assert {name}(-3, 0, 10) == 0",
       "assert {name}(42, 0, 10) == 10"),
    _f("to_fahrenheit", ["celsius_to_fahrenheit", "c_to_f", "to_fahrenheit"],
       "fahrenheit_from_celsius", N1,
       ["Convert {0} degrees Celsius to Fahrenheit.",
        "Return the Fahrenheit temperature for {0} degrees Celsius."],
       "    return {0} * 9 / 5 + 32",
       "assert {name}(0) == 32", "assert {name}(100) == 212", "assert {name}(-40) == -40"),
    _f("is_power_of_two", ["is_power_of_two", "power_of_two", "check_power_of_two"],
       "is_two_power", N1,
       ["Return True when {0} is a power of two.", "Check whether {0} is a power of 2."],
       "    return {0} > 0 and {0} & ({0} - 1) == 0",
       "assert {name}(8) is True", "assert {name}(6) is False", "assert {name}(1) is True",
       "assert {name}(0) is False"),
)  # fmt: skip

STRINGS = (
    _f("reverse_string", ["reverse_string", "reverse", "reversed_text", "flip"], "backwards", S1,
       ["Return {0} reversed.", "Return the characters of {0} in reverse order."],
       "    return {0}[::-1]",
       "assert {name}('hello') == 'olleh'", "assert {name}('') == ''",
       "assert {name}('ab') == 'ba'"),
    _f("count_vowels", ["count_vowels", "vowel_count", "num_vowels"], "how_many_vowels", S1,
       ["Return the number of vowels (a, e, i, o, u) in {0}.", "Count the vowels in {0}."],
       "    return sum(1 for c in {0}.lower() if c in 'aeiou')",
       "assert {name}('hello') == 2", "assert {name}('xyz') == 0", "assert {name}('AEIOU') == 5"),
    _f("is_palindrome", ["is_palindrome", "palindrome", "check_palindrome"],
       "reads_same_backwards", S1,
       ["Return True when {0} reads the same forwards and backwards.",
        "Check whether {0} is a palindrome."],
       "    return {0} == {0}[::-1]",
       "assert {name}('racecar') is True", "assert {name}('hello') is False",
       "assert {name}('') is True"),
    _f("to_upper", ["to_upper", "uppercase", "shout"], "make_upper", S1,
       ["Return {0} in upper case.", "Return {0} converted to capital letters."],
       "    return {0}.upper()",
       "assert {name}('abc') == 'ABC'", "assert {name}('Hi 2') == 'HI 2'"),
    _f("count_words", ["count_words", "word_count", "num_words"], "how_many_words", S1,
       ["Return the number of words in {0}.", "Count the whitespace-separated words in {0}."],
       "    return len({0}.split())",
       "assert {name}('a b c') == 3", "assert {name}('') == 0",
       "assert {name}('  hello   world ') == 2"),
    _f("first_char", ["first_char", "first_letter", "initial"], "leading_char", S1,
       ["Return the first character of {0}, or an empty string when {0} is empty.",
        "Return the first letter of {0} (an empty string for an empty input)."],
       "    return {0}[:1]",
       "assert {name}('hello') == 'h'", "assert {name}('') == ''"),
    _f("title_case", ["title_case", "capitalize_words", "capitalise_words"], "capitalize_each",
       S1,
       ["Return {0} with the first letter of every word capitalised.",
        "Capitalize each word of {0} and return the result."],
       "    return ' '.join(w.capitalize() for w in {0}.split())",
       "assert {name}('hello world') == 'Hello World'", "assert {name}('a') == 'A'"),
    _f("repeat_string", ["repeat", "repeat_string", "repeat_text"], "duplicate_text", SN,
       ["Return {0} repeated {1} times.", "Return the string {0} written {1} times in a row."],
       "    return {0} * {1}",
       "assert {name}('ab', 3) == 'ababab'", "assert {name}('x', 0) == ''"),
    _f("count_char", ["count_char", "count_letter", "occurrences"], "char_frequency", SC,
       ["Return how many times the character {1} appears in {0}.",
        "Count the occurrences of {1} in {0}."],
       "    return {0}.count({1})",
       "assert {name}('banana', 'a') == 3", "assert {name}('hello', 'z') == 0"),
    _f("starts_with", ["starts_with", "has_prefix", "begins_with"], "opens_with", SP,
       ["Return True when {0} starts with {1}.", "Check whether {0} begins with {1}."],
       "    return {0}.startswith({1})",
       "assert {name}('hello', 'he') is True", "assert {name}('hello', 'lo') is False"),
    _f("remove_spaces", ["remove_spaces", "strip_spaces", "no_spaces"], "delete_spaces", S1,
       ["Return {0} with every space removed.", "Remove all spaces from {0} and return it."],
       "    return {0}.replace(' ', '')",
       "assert {name}('a b c') == 'abc'", "assert {name}('  ') == ''"),
    _f("is_anagram", ["is_anagram", "anagrams", "check_anagram"], "same_letters", S2,
       ["Return True when {0} and {1} are anagrams of each other.",
        "Check whether {1} uses exactly the letters of {0}."],
       "    return sorted({0}) == sorted({1})",
       "assert {name}('listen', 'silent') is True", "assert {name}('abc', 'abd') is False"),
    _f("longest_word", ["longest_word", "find_longest_word", "longest"], "biggest_word", S1,
       ["Return the longest word in {0} (the first one on a tie).",
        "Return the word of {0} with the most letters; on a tie, the first."],
       "    return max({0}.split(), key=len)",
       "assert {name}('a bbb cc') == 'bbb'", "assert {name}('one two six') == 'one'"),
    _f("join_words", ["join_words", "join_with_spaces", "make_line"], "make_sentence", L1,
       ["Return the strings in {0} joined by single spaces.",
        "Join the words of the list {0} with a space between each."],
       "    return ' '.join({0})",
       "assert {name}(['a', 'b']) == 'a b'", "assert {name}([]) == ''"),
)  # fmt: skip

LISTS = (
    _f("sum_list", ["sum_list", "total", "list_sum"], "add_all", L1,
       ["Return the sum of the numbers in {0}.", "Add up every number in the list {0}."],
       "    total = 0\n    for v in {0}:\n        total += v\n    return total",
       "assert {name}([1, 2, 3]) == 6", "assert {name}([]) == 0", "assert {name}([-1, 1]) == 0"),
    _f("max_list", ["max_in_list", "largest", "find_max", "list_max"], "biggest_number", L1,
       ["Return the largest number in {0}.", "Return the maximum of the list {0}."],
       "    return max({0})",
       "assert {name}([3, 9, 2]) == 9", "assert {name}([-5, -1]) == -1"),
    _f("min_list", ["min_in_list", "smallest", "find_min", "list_min"], "smallest_number", L1,
       ["Return the smallest number in {0}.", "Return the minimum of the list {0}."],
       "    return min({0})",
       "assert {name}([3, 9, 2]) == 2", "assert {name}([-5, -1]) == -5"),
    _f("average_list", ["average_list", "mean", "list_average"], "mean_value", L1,
       ["Return the average of the numbers in {0}, or 0 for an empty list.",
        "Return the mean of {0} (0 when {0} is empty)."],
       "    if not {0}:\n        return 0\n    return sum({0}) / len({0})",
       "assert {name}([1, 2, 3]) == 2", "assert {name}([]) == 0", "assert {name}([1, 2]) == 1.5"),
    _f("count_evens", ["count_evens", "num_evens", "even_count"], "how_many_even", L1,
       ["Return how many even numbers {0} contains.", "Count the even numbers in {0}."],
       "    return sum(1 for v in {0} if v % 2 == 0)",
       "assert {name}([1, 2, 4, 7]) == 2", "assert {name}([]) == 0"),
    _f("filter_evens", ["evens", "filter_even", "only_evens", "even_numbers"], "keep_even", L1,
       ["Return a list of the even numbers in {0}, in order.",
        "Return only the even numbers of {0}."],
       "    return [v for v in {0} if v % 2 == 0]",
       "assert {name}([1, 2, 3, 4]) == [2, 4]", "assert {name}([1, 3]) == []"),
    _f("filter_positive", ["positives", "filter_positive", "only_positive"], "keep_positive",
       L1,
       ["Return a list of the numbers in {0} that are greater than zero.",
        "Return only the positive numbers of {0}, in order."],
       "    return [v for v in {0} if v > 0]",
       "assert {name}([-1, 2, 0, 5]) == [2, 5]", "assert {name}([]) == []"),
    _f("squares", ["squares", "square_all", "squared_list"], "square_each", L1,
       ["Return a list of the squares of the numbers in {0}.",
        "Return a new list with every number of {0} squared."],
       "    return [v * v for v in {0}]",
       "assert {name}([1, 2, 3]) == [1, 4, 9]", "assert {name}([]) == []"),
    _f("reverse_list", ["reverse_list", "reversed_list", "backwards_list"], "flip_list", L1,
       ["Return a new list with the items of {0} in reverse order.", "Return {0} reversed."],
       "    return {0}[::-1]",
       "assert {name}([1, 2, 3]) == [3, 2, 1]", "assert {name}([]) == []"),
    _f("unique", ["unique", "dedupe", "remove_duplicates"], "distinct_items", L1,
       ["Return the items of {0} without duplicates, keeping their first order.",
        "Remove repeated items from {0}, keeping the first of each."],
       "    seen = set()\n    out = []\n    for v in {0}:\n        if v not in seen:\n"
       "            seen.add(v)\n            out.append(v)\n    return out",
       "assert {name}([1, 2, 1, 3, 2]) == [1, 2, 3]", "assert {name}([]) == []"),
    _f("second_largest", ["second_largest", "second_max", "next_largest"], "runner_up", L1,
       ["Return the second largest distinct number in {0}.",
        "Return the second biggest value of {0}, ignoring repeats."],
       "    return sorted(set({0}))[-2]",
       "assert {name}([3, 1, 4, 4]) == 3", "assert {name}([10, 20]) == 10"),
    _f("contains", ["contains", "has_item", "includes"], "is_member", LT,
       ["Return True when {1} is in {0}.", "Check whether the list {0} contains {1}."],
       "    return {1} in {0}",
       "assert {name}([1, 2, 3], 2) is True", "assert {name}([], 1) is False"),
    _f("index_of", ["index_of", "find_index", "position"], "locate", LT,
       ["Return the index of {1} in {0}, or -1 when it is missing.",
        "Return where {1} first appears in {0}, or -1 if it does not."],
       "    for i, v in enumerate({0}):\n        if v == {1}:\n            return i\n    return -1",
       "assert {name}([5, 6, 7], 7) == 2", "assert {name}([5, 6], 9) == -1"),
    _f("flatten", ["flatten", "flatten_list", "flat"], "merge_sublists", L1,
       ["Return a flat list of the items in the lists inside {0}.",
        "Flatten the list of lists {0} into one list."],
       "    return [v for sub in {0} for v in sub]",
       "assert {name}([[1, 2], [3], []]) == [1, 2, 3]", "assert {name}([]) == []"),
    _f("count_occurrences", ["count_occurrences", "count_of", "count_item"], "tally", LT,
       ["Return how many times {1} appears in {0}.", "Count the occurrences of {1} in {0}."],
       "    return {0}.count({1})",
       "assert {name}([1, 2, 1, 1], 1) == 3", "assert {name}([], 5) == 0"),
    _f("last_item", ["last", "last_item", "final_element"], "tail_item", L1,
       ["Return the last item of {0}, or None when it is empty.",
        "Return the final element of {0} (None for an empty list)."],
       "    return {0}[-1] if {0} else None",
       "assert {name}([1, 2, 3]) == 3", "assert {name}([]) is None"),
    _f("sort_desc", ["sort_descending", "sorted_desc", "descending"], "order_high_to_low", L1,
       ["Return the numbers of {0} sorted from largest to smallest.",
        "Return a copy of {0} in descending order."],
       "    return sorted({0}, reverse=True)",
       "assert {name}([2, 9, 4]) == [9, 4, 2]", "assert {name}([]) == []"),
    _f("product", ["product", "list_product", "multiply_all"], "multiply_items", L1,
       ["Return the product of the numbers in {0} (1 for an empty list).",
        "Multiply all numbers of {0} together and return the result."],
       "    result = 1\n    for v in {0}:\n        result *= v\n    return result",
       "assert {name}([2, 3, 4]) == 24", "assert {name}([]) == 1"),
    _f("running_sum", ["running_sum", "cumulative_sum", "prefix_sums"], "accumulate_totals",
       L1,
       ["Return the running totals of {0}.",
        "Return a list whose i-th item is the sum of the first i + 1 numbers of {0}."],
       "    total = 0\n    out = []\n    for v in {0}:\n        total += v\n"
       "        out.append(total)\n    return out",
       "assert {name}([1, 2, 3]) == [1, 3, 6]", "assert {name}([]) == []"),
    _f("is_sorted", ["is_sorted", "sorted_check", "is_ascending"], "in_order", L1,
       ["Return True when {0} is sorted in ascending order.",
        "Check whether the items of {0} never decrease."],
       "    return all({0}[i] <= {0}[i + 1] for i in range(len({0}) - 1))",
       "assert {name}([1, 2, 2, 5]) is True", "assert {name}([3, 1]) is False",
       "assert {name}([]) is True"),
)  # fmt: skip

DICTS = (
    _f("char_counts", ["char_counts", "letter_frequencies", "count_letters"],
       "character_histogram", S1,
       ["Return a dict mapping each character of {0} to how many times it appears.",
        "Count every character of {0} in a dictionary."],
       "    counts = {{}}\n    for ch in {0}:\n        counts[ch] = counts.get(ch, 0) + 1\n"
       "    return counts",
       "assert {name}('aba') == {{'a': 2, 'b': 1}}", "assert {name}('') == {{}}"),
    _f("word_counts", ["word_counts", "word_frequencies", "count_each_word"], "tally_words", S1,
       ["Return a dict mapping each word of {0} to the number of times it occurs.",
        "Count how often every word appears in {0}."],
       "    counts = {{}}\n    for w in {0}.split():\n        counts[w] = counts.get(w, 0) + 1\n"
       "    return counts",
       "assert {name}('a b a') == {{'a': 2, 'b': 1}}", "assert {name}('') == {{}}"),
    _f("invert_dict", ["invert", "invert_dict", "swap_keys_values"], "reverse_mapping", D1,
       ["Return a new dict with the keys and values of {0} swapped.",
        "Invert the dictionary {0} so values become keys."],
       "    return {{v: k for k, v in {0}.items()}}",
       "assert {name}({{'a': 1, 'b': 2}}) == {{1: 'a', 2: 'b'}}", "assert {name}({{}}) == {{}}"),
    _f("get_value", ["get_value", "lookup_key", "value_for"], "value_or_none", DK,
       ["Return the value of {1} in {0}, or None when the key is missing.",
        "Look up {1} in the dict {0}; return None if it is absent."],
       "    return {0}.get({1})",
       "assert {name}({{'a': 1}}, 'a') == 1", "assert {name}({{}}, 'x') is None"),
    _f("sorted_keys", ["sorted_keys", "keys_in_order", "ordered_key_list"], "ordered_keys", D1,
       ["Return the keys of {0} as a sorted list.", "Return a sorted list of the keys of {0}."],
       "    return sorted({0})",
       "assert {name}({{'b': 1, 'a': 2}}) == ['a', 'b']", "assert {name}({{}}) == []"),
    _f("merge_dicts", ["merge", "merge_dicts", "combine_dicts"], "join_dicts", DD,
       ["Return a new dict with the items of {0} and {1}; values of {1} win.",
        "Merge the dictionaries {0} and {1} into a new one, preferring {1} on conflicts."],
       "    return {{**{0}, **{1}}}",
       "assert {name}({{'a': 1}}, {{'b': 2}}) == {{'a': 1, 'b': 2}}",
       "assert {name}({{'a': 1}}, {{'a': 3}}) == {{'a': 3}}"),
    _f("sum_values", ["sum_values", "total_values", "values_total"], "add_up_values", D1,
       ["Return the sum of the values in {0}.", "Add up all the values of the dict {0}."],
       "    return sum({0}.values())",
       "assert {name}({{'a': 1, 'b': 2}}) == 3", "assert {name}({{}}) == 0"),
    _f("key_of_max", ["key_of_max", "argmax_key", "max_key"], "top_key", D1,
       ["Return the key of {0} with the largest value.",
        "Return the key whose value in {0} is the biggest."],
       "    return max({0}, key={0}.get)",
       "assert {name}({{'a': 1, 'b': 5, 'c': 2}}) == 'b'"),
    _f("group_by_length", ["group_by_length", "words_by_length", "length_groups"],
       "bucket_by_length", L1,
       ["Return a dict mapping each length to the list of words in {0} of that length.",
        "Group the words of {0} by their length in a dictionary."],
       "    groups = {{}}\n    for w in {0}:\n        groups.setdefault(len(w), []).append(w)\n"
       "    return groups",
       "assert {name}(['a', 'bb', 'c']) == {{1: ['a', 'c'], 2: ['bb']}}",
       "assert {name}([]) == {{}}"),
)  # fmt: skip

RECURSION = (
    _f("recursive_sum", ["recursive_sum", "sum_recursive", "rec_sum"], "sum_recursively", L1,
       ["Return the sum of {0} using recursion.", "Add up the list {0} recursively."],
       "    if not {0}:\n        return 0\n    return {0}[0] + {name}({0}[1:])",
       "assert {name}([1, 2, 3]) == 6", "assert {name}([]) == 0"),
    _f("countdown", ["countdown", "count_down", "descending_range"], "count_backwards", N1,
       ["Return a list counting down from {0} to 1.", "Return the numbers {0}, {0} - 1, ..., 1."],
       "    return list(range({0}, 0, -1))",
       "assert {name}(3) == [3, 2, 1]", "assert {name}(0) == []"),
    _f("to_binary", ["to_binary", "binary", "binary_string"], "binary_digits", N1,
       ["Return the binary representation of {0} as a string without the 0b prefix.",
        "Return {0} written in base 2 as a string."],
       "    return bin({0})[2:]",
       "assert {name}(5) == '101'", "assert {name}(0) == '0'", "assert {name}(8) == '1000'"),
    _f("deep_flatten", ["deep_flatten", "flatten_deep", "flatten_all"], "flatten_nested", L1,
       ["Return a flat list of all the numbers in the nested lists {0}.",
        "Flatten {0}, whose lists may nest to any depth, recursively."],
       "    out = []\n    for v in {0}:\n        if isinstance(v, list):\n"
       "            out.extend({name}(v))\n        else:\n            out.append(v)\n"
       "    return out",
       "assert {name}([1, [2, [3, 4]], 5]) == [1, 2, 3, 4, 5]", "assert {name}([]) == []"),
    _f("reverse_recursive", ["reverse_recursive", "rec_reverse", "recursive_reverse"],
       "reverse_by_recursion", S1,
       ["Return {0} reversed, using recursion.", "Reverse the string {0} recursively."],
       "    if not {0}:\n        return ''\n    return {name}({0}[1:]) + {0}[0]",
       "assert {name}('abc') == 'cba'", "assert {name}('') == ''"),
)  # fmt: skip

CLASSES = (
    _c("counter", ["Counter", "ClickCounter", "Tally"], "HitCounter",
       ["A counter that starts at 0, with a method `increment()` that adds one and a method "
        "`value()` that returns the count.",
        "It counts up from 0: `increment()` adds one, `value()` returns the current count."],
       "class {name}:\n    def __init__(self):\n        self.count = 0\n\n"
       "    def increment(self):\n        self.count += 1\n\n"
       "    def value(self):\n        return self.count",
       "c = {name}()\nc.increment()\nc.increment()\nassert c.value() == 2",
       "assert {name}().value() == 0"),
    _c("stack", ["Stack", "ItemStack", "SimpleStack"], "LifoStack",
       ["A stack with methods `push(item)`, `pop()` that removes and returns the last item, "
        "and `is_empty()`.",
        "A last-in first-out stack: `push(item)`, `pop()` and `is_empty()`."],
       "class {name}:\n    def __init__(self):\n        self.items = []\n\n"
       "    def push(self, item):\n        self.items.append(item)\n\n"
       "    def pop(self):\n        return self.items.pop()\n\n"
       "    def is_empty(self):\n        return not self.items",
       "s = {name}()\nassert s.is_empty()\ns.push(1)\ns.push(2)\nassert s.pop() == 2\n"
       "assert not s.is_empty()"),
    _c("queue", ["Queue", "FifoQueue", "SimpleQueue"], "WaitingLine",
       ["A queue with methods `enqueue(item)`, `dequeue()` that removes and returns the oldest "
        "item, and `size()`.",
        "A first-in first-out queue: `enqueue(item)`, `dequeue()` and `size()`."],
       "class {name}:\n    def __init__(self):\n        self.items = []\n\n"
       "    def enqueue(self, item):\n        self.items.append(item)\n\n"
       "    def dequeue(self):\n        return self.items.pop(0)\n\n"
       "    def size(self):\n        return len(self.items)",
       "q = {name}()\nq.enqueue(1)\nq.enqueue(2)\nassert q.size() == 2\nassert q.dequeue() == 1\n"
       "assert q.size() == 1"),
    _c("rectangle", ["Rectangle", "Rect", "Box"], "RectangleShape",
       ["A rectangle built from `width` and `height`, with methods `area()` and `perimeter()`.",
        "Made with `{name}(width, height)`; `area()` and `perimeter()` return its measures."],
       "class {name}:\n    def __init__(self, width, height):\n        self.width = width\n"
       "        self.height = height\n\n    def area(self):\n"
       "        return self.width * self.height\n\n    def perimeter(self):\n"
       "        return 2 * (self.width + self.height)",
       "r = {name}(3, 4)\nassert r.area() == 12\nassert r.perimeter() == 14"),
    _c("account", ["BankAccount", "Account", "Wallet"], "SavingsAccount",
       ["A bank account starting at 0 with `deposit(amount)`, `withdraw(amount)` that returns "
        "False when the balance is too low, and `balance()`.",
        "It holds money: `deposit(amount)`, `withdraw(amount)` (False if there is not enough) "
        "and `balance()`."],
       "class {name}:\n    def __init__(self):\n        self.total = 0\n\n"
       "    def deposit(self, amount):\n        self.total += amount\n\n"
       "    def withdraw(self, amount):\n        if amount > self.total:\n"
       "            return False\n        self.total -= amount\n        return True\n\n"
       "    def balance(self):\n        return self.total",
       "a = {name}()\na.deposit(10)\nassert a.withdraw(3) is True\nassert a.balance() == 7\n"
       "assert a.withdraw(50) is False\nassert a.balance() == 7"),
    _c("point", ["Point", "Vector2", "Position"], "Coordinate",
       ["A 2D point made from `x` and `y` with a method `distance_to(other)` that returns the "
        "Euclidean distance.",
        "Built as `{name}(x, y)`; `distance_to(other)` gives the straight-line distance."],
       "class {name}:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
       "    def distance_to(self, other):\n"
       "        return ((self.x - other.x) ** 2 + (self.y - other.y) ** 2) ** 0.5",
       "assert {name}(0, 0).distance_to({name}(3, 4)) == 5"),
)  # fmt: skip

FAMILIES: tuple[Family, ...] = ARITHMETIC + STRINGS + LISTS + DICTS + RECURSION + CLASSES
