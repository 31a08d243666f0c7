"""The draft-schedule probe's own prompts (dcoco.serving.vllm.schedule_probe), used where
`dcoco serve --schedule-prompts` gives none."""

# Our own prompts (no benchmark suite's): code, arithmetic, explanation and chat, so the probe's
# acceptance is a mix like a server's. `dcoco serve --schedule-prompts` replaces them with a
# sample of the server's own traffic: how often drafts are accepted decides where drafting pays.
PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number.",
    "What is 17 times 23? Show the steps.",
    "Explain what a hash table is to a beginner.",
    "Give me three ideas for a rainy weekend.",
    "Write a SQL query that counts orders per customer.",
    "A train travels 60 km in 45 minutes. What is its speed in km/h?",
    "Summarise the water cycle in a few sentences.",
    "Write a short poem about autumn leaves.",
    "Write a JavaScript function that removes duplicates from an array.",
    "If a shirt costs 25 dollars after a 20% discount, what was the original price?",
    "What are the main differences between TCP and UDP?",
    "Suggest a name for a coffee shop and explain it.",
    "Write a bash command that finds the ten largest files in a directory.",
    "Sam has 3 boxes of 12 pencils and gives away 7. How many are left?",
    "Why is the sky blue?",
    "Write a polite email declining a meeting invitation.",
    "Implement binary search in Python.",
    "What is the sum of the integers from 1 to 100?",
    "Explain recursion with an example.",
    "List five healthy breakfast options.",
    "Write a Python class for a simple bank account.",
    "A rectangle is 8 cm by 5 cm. What are its area and perimeter?",
    "How does a vaccine train the immune system?",
    "Write a haiku about the sea.",
    "Write a function in C that reverses a string in place.",
    "Convert 98.6 degrees Fahrenheit to Celsius.",
    "What causes the seasons on Earth?",
    "Give tips for learning a new language.",
    "Write a Python script that reads a CSV file and prints each row.",
    "A recipe needs 3 eggs for 4 people. How many eggs for 10 people?",
    "Describe how photosynthesis works.",
    "Plan a one-day trip to a city you like.",
)
